//! One engine per fio thread: a tokio runtime that owns the sessions, a task per I/O, and the
//! completion queue fio's thread reaps. fio's thread only hands I/Os over (`submit`) and
//! collects them (`reap`); all network work happens on the runtime's threads.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use netdam_initiator::{AsyncClient, Client, ClientError, ClientOptions, Op, Volume, VolumeOptions};
use netdam_isa::control::RegionInfo;
use netdam_isa::limits::MAX_BLOCK_ZERO_BYTES;
use netdam_isa::Status;
use tokio::runtime::Runtime;

use crate::completions::{Completion, Completions, Cookie};
use crate::settings::{Poll, Settings, SpaceName};

/// I/O failures printed in full per engine; fio reports each failed I/O itself, so after these
/// only a count is printed (at close), rather than one line per I/O of a failing run.
const REPORTED_ERRORS_MAX: u32 = 8;

/// How long closing waits for the sessions' I/O tasks to say CLOSE (each waits at most 100 ms
/// for the target's confirmation): a session left open holds a target slot until it expires.
const CLOSE_WAIT: Duration = Duration::from_millis(500);

/// Most runtime threads one engine starts: each session's I/O task needs little CPU, and fio
/// runs an engine per job, so more would only compete with fio's own threads.
const RUNTIME_THREADS_MAX: usize = 4;

/// What an I/O asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Read into fio's buffer.
    Read,
    /// Write fio's buffer.
    Write,
    /// Make answered writes durable.
    Sync,
    /// Deallocate (namespace) or zero (region) the range.
    Trim,
}

impl Kind {
    /// The C ABI's `enum netdam_fio_kind`.
    pub fn from_abi(kind: u32) -> Option<Kind> {
        match kind {
            0 => Some(Kind::Read),
            1 => Some(Kind::Write),
            2 => Some(Kind::Sync),
            3 => Some(Kind::Trim),
            _ => None,
        }
    }
}

/// One I/O.
#[derive(Debug)]
pub enum Io {
    /// Read `buffer.len()` bytes at `offset` into fio's buffer.
    Read { offset: u64, buffer: IoBuffer },
    /// Write fio's buffer at `offset`.
    Write { offset: u64, buffer: IoBuffer },
    /// Make every answered write durable.
    Sync,
    /// Deallocate (namespace) or zero (region) `len` bytes at `offset`.
    Trim { offset: u64, len: u64 },
}

impl Io {
    /// For messages: `write of 4096 bytes at offset 8192`.
    fn describe(&self) -> String {
        match self {
            Io::Read { offset, buffer } => format!("read of {} bytes at offset {offset}", buffer.len()),
            Io::Write { offset, buffer } => format!("write of {} bytes at offset {offset}", buffer.len()),
            Io::Sync => "sync".to_string(),
            Io::Trim { offset, len } => format!("trim of {len} bytes at offset {offset}"),
        }
    }
}

/// Why the engine could not start: the errno fio records, and a message naming the option at
/// fault (`namespace=foo: the target has no namespace "foo" (it has: disk)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenError {
    /// What fio reports as the job's error.
    pub errno: i32,
    /// What the user reads.
    pub message: String,
}

impl OpenError {
    fn new(errno: i32, message: String) -> OpenError {
        OpenError { errno, message }
    }

    /// A failure of `option` (`target=...`, `namespace=...`) reported by the client.
    fn client(option: &str, error: ClientError) -> OpenError {
        OpenError::new(errno_of(&error), format!("{option}: {error}"))
    }
}

/// fio's buffer of one I/O.
#[derive(Debug)]
pub struct IoBuffer {
    start: *mut u8,
    len: usize,
}

// SAFETY: fio allocates an io_u's buffer for the job's lifetime and does not read, write or free
// it while the io_u is in flight (from `queue` until `event` hands the io_u back), which is
// exactly as long as the I/O task holds this; only that task touches the bytes meanwhile.
unsafe impl Send for IoBuffer {}

impl IoBuffer {
    /// Wraps `len` bytes at `start`.
    ///
    /// # Safety
    /// Unless `len` is 0, `start` must be valid for reads and writes of `len` bytes, and nothing
    /// else may access them, until the I/O this buffer belongs to has completed.
    pub unsafe fn new(start: *mut u8, len: usize) -> IoBuffer {
        IoBuffer { start, len }
    }

    /// Bytes in the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty (a sync).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `new`'s contract: valid for `len` bytes, ours alone until completion.
        unsafe { std::slice::from_raw_parts(self.start, self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `as_slice`; `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.start, self.len) }
    }
}

/// What `netdam_fio_probe` tells fio.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpaceSize {
    /// Size in bytes.
    pub size_bytes: u64,
    /// Offsets and lengths must be multiples of it.
    pub block_bytes: u32,
}

/// Connects once, without threads (fio may call this in its parent process, before it forks
/// the jobs), and describes the namespace or region. The message names the option at fault.
pub fn probe(settings: &Settings) -> Result<SpaceSize, OpenError> {
    let client = Client::connect_with(settings.target, ClientOptions::default())
        .map_err(|error| OpenError::client(&settings.target_option(), error))?;
    let size = match &settings.space {
        SpaceName::Namespace(name) => client.namespace(name).map(|namespace| SpaceSize {
            size_bytes: namespace.capacity_blocks * u64::from(namespace.block_bytes),
            block_bytes: namespace.block_bytes,
        }),
        SpaceName::Region(name) => {
            client.region(name).map(|region| SpaceSize { size_bytes: region.size_bytes, block_bytes: 1 })
        }
    };
    let size = size.map_err(|error| OpenError::client(&settings.space.option(), error));
    // Frees the session's slot now; if the target does not confirm, it expires there later.
    let _ = client.close();
    size
}

/// The namespace or region, with the sessions that reach it.
#[derive(Debug)]
enum Space {
    Namespace(Volume),
    Region(Region),
}

/// A region over one or more sessions.
#[derive(Debug)]
struct Region {
    sessions: Vec<AsyncClient>,
    info: RegionInfo,
    /// Next session to give an I/O to (round robin).
    next: AtomicUsize,
}

impl Region {
    fn session(&self) -> &AsyncClient {
        &self.sessions[self.next.fetch_add(1, Ordering::Relaxed) % self.sessions.len()]
    }

    /// Reads into fio's buffer directly, every chunk in flight at once.
    async fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), ClientError> {
        self.session().read_into(self.info.id, offset, out).await
    }

    /// Zeroes a range with FILL, in pieces no larger than a namespace's TRIM, so that one fio
    /// trim does not hold a target worker longer than a block trim would.
    async fn zero(&self, offset: u64, len: u64) -> Result<(), ClientError> {
        let client = self.session();
        let mut answers = Vec::new();
        let mut done = 0;
        while done < len {
            let piece = (len - done).min(MAX_BLOCK_ZERO_BYTES);
            answers.push(client.submit(vec![Op::fill(self.info.id, offset + done, piece as u32, 0)]).await?);
            done += piece;
        }
        for answer in answers {
            answer.wait().await?.data(0)?;
        }
        Ok(())
    }
}

/// What the I/O tasks share.
#[derive(Debug)]
struct Shared {
    space: Space,
    /// `namespace=disk` or `region=scratch`: the prefix of I/O error messages.
    option: String,
    errors: AtomicU32,
}

impl Shared {
    async fn execute(&self, io: &mut Io) -> Result<(), ClientError> {
        match (&self.space, io) {
            (Space::Namespace(volume), Io::Read { offset, buffer }) => {
                volume.read(*offset, buffer.as_mut_slice()).await
            }
            (Space::Namespace(volume), Io::Write { offset, buffer }) => {
                volume.write(*offset, buffer.as_slice(), false).await
            }
            (Space::Namespace(volume), Io::Sync) => volume.flush().await,
            (Space::Namespace(volume), Io::Trim { offset, len }) => volume.trim(*offset, *len).await,
            (Space::Region(region), Io::Read { offset, buffer }) => region.read(*offset, buffer.as_mut_slice()).await,
            (Space::Region(region), Io::Write { offset, buffer }) => {
                region.session().write(region.info.id, *offset, buffer.as_slice()).await
            }
            // A region acknowledges a write once it is as durable as the region can make it
            // (persisted, on a persistent region): a sync has nothing left to wait for.
            (Space::Region(_), Io::Sync) => Ok(()),
            (Space::Region(region), Io::Trim { offset, len }) => region.zero(*offset, *len).await,
        }
    }

    /// Prints the first few failures in full (fio prints only an errno per I/O).
    fn report(&self, io: &Io, error: &ClientError) {
        if self.errors.fetch_add(1, Ordering::Relaxed) < REPORTED_ERRORS_MAX {
            eprintln!("netdam: {}: {}: {error}", self.option, io.describe());
        }
    }
}

/// The errno fio reports for a failed I/O.
fn errno_of(error: &ClientError) -> i32 {
    match error {
        ClientError::Unaligned { .. }
        | ClientError::BeyondEnd { .. }
        | ClientError::PartialBlock { .. }
        | ClientError::TooLarge(_) => libc::EINVAL,
        ClientError::Refused { status, .. } | ClientError::DatagramRefused(status) => match status {
            Status::OutOfRange | Status::Unaligned | Status::TooLarge | Status::NoSuchSpace => libc::EINVAL,
            Status::NotSupported | Status::UnknownOpcode => libc::EOPNOTSUPP,
            Status::PermissionDenied => libc::EACCES,
            Status::Busy => libc::EBUSY,
            _ => libc::EIO,
        },
        ClientError::TimedOut { .. } | ClientError::OutcomeUnknown { .. } => libc::ETIMEDOUT,
        ClientError::NotListening(_) => libc::ECONNREFUSED,
        ClientError::Closed => libc::ESHUTDOWN,
        ClientError::NoSuchNamespace { .. } | ClientError::NoSuchRegion { .. } => libc::ENOENT,
        ClientError::Setting(_) => libc::EINVAL,
        ClientError::HelloRefused(_) => libc::EBUSY,
        _ => libc::EIO,
    }
}

/// Completes an I/O exactly once: with its result, or, if its task ends without one (a panic,
/// or the runtime shutting down), with EIO, so that fio never waits for it forever.
struct CompletionGuard {
    completions: Arc<Completions>,
    cookie: Cookie,
    errno: i32,
}

impl Drop for CompletionGuard {
    fn drop(&mut self) {
        self.completions.push(Completion { cookie: self.cookie, errno: self.errno });
    }
}

/// The engine of one fio thread.
#[derive(Debug)]
pub struct Engine {
    // Declared before the runtime so that the sessions' handles go first (see `close`).
    shared: Option<Arc<Shared>>,
    runtime: Option<Runtime>,
    completions: Arc<Completions>,
    poll: Poll,
    /// I/Os submitted and not yet reaped; only fio's thread changes it.
    in_flight: usize,
}

impl Engine {
    /// Starts the runtime and the sessions. `iodepth` bounds the I/Os in flight. The message
    /// names the option at fault.
    pub fn open(settings: &Settings, iodepth: usize) -> Result<Engine, OpenError> {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let threads = settings.sessions.min(cores).clamp(1, RUNTIME_THREADS_MAX);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("netdam-fio")
            .enable_io()
            .enable_time()
            .build()
            .map_err(|error| {
                let errno = error.raw_os_error().unwrap_or(libc::EAGAIN);
                OpenError::new(errno, format!("cannot start the I/O runtime ({threads} threads): {error}"))
            })?;
        let space = runtime.block_on(connect(settings))?;
        let shared = Shared { space, option: settings.space.option(), errors: AtomicU32::new(0) };
        Ok(Engine {
            shared: Some(Arc::new(shared)),
            runtime: Some(runtime),
            completions: Arc::new(Completions::new(iodepth)),
            poll: settings.poll,
            in_flight: 0,
        })
    }

    /// Starts one I/O; its completion carries `cookie`. Fails (with an errno, and no completion
    /// to follow) only when fio exceeds the iodepth it gave at open.
    pub fn submit(&mut self, mut io: Io, cookie: Cookie) -> Result<(), i32> {
        let (Some(shared), Some(runtime)) = (&self.shared, &self.runtime) else { return Err(libc::ESHUTDOWN) };
        if self.in_flight >= self.completions.capacity() {
            eprintln!(
                "netdam: {}: more than iodepth={} I/Os submitted at once (a bug in the fio shim)",
                shared.option,
                self.completions.capacity()
            );
            return Err(libc::EBUSY);
        }
        self.in_flight += 1;
        let shared = Arc::clone(shared);
        let mut guard = CompletionGuard { completions: Arc::clone(&self.completions), cookie, errno: libc::EIO };
        runtime.spawn(async move {
            match shared.execute(&mut io).await {
                Ok(()) => guard.errno = 0,
                Err(error) => {
                    shared.report(&io, &error);
                    guard.errno = errno_of(&error);
                }
            }
            drop(guard);
        });
        Ok(())
    }

    /// Waits for at least `min` completions (no more than are in flight) until `timeout`
    /// (`None`: no limit), and hands up to `max` to `sink`. Returns how many.
    pub fn reap(&mut self, min: usize, max: usize, timeout: Option<Duration>, sink: impl FnMut(Completion)) -> usize {
        // Waiting for more than are in flight would wait forever.
        let min = min.min(self.in_flight);
        let deadline = timeout.map(|timeout| Instant::now() + timeout);
        let taken = self.completions.take(min, max, deadline, self.poll, sink);
        self.in_flight = self.in_flight.saturating_sub(taken);
        taken
    }

    /// Closes the sessions (each says CLOSE, so the target frees its slot at once) and stops
    /// the runtime. I/Os still in flight are abandoned.
    pub fn close(mut self) {
        let Some(runtime) = self.runtime.take() else { return };
        let shared = self.shared.take();
        let errors = shared.as_ref().map_or(0, |shared| shared.errors.load(Ordering::Relaxed));
        if errors > REPORTED_ERRORS_MAX {
            let option = shared.as_ref().map_or("", |shared| shared.option.as_str());
            eprintln!("netdam: {option}: {errors} I/Os failed in all ({REPORTED_ERRORS_MAX} shown)");
        }
        // The last handle of each session ends its I/O task, which says CLOSE and then returns;
        // give those tasks a bounded time before stopping the runtime under them.
        drop(shared);
        let deadline = Instant::now() + CLOSE_WAIT;
        while runtime.metrics().num_alive_tasks() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        runtime.shutdown_timeout(Duration::from_millis(100));
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // `close` takes the runtime; an engine dropped otherwise (a failed open) stops it
        // without waiting, from fio's thread, which is outside the runtime.
        if let Some(runtime) = self.runtime.take() {
            self.shared.take();
            runtime.shutdown_background();
        }
    }
}

/// Opens the sessions and finds the namespace or region. The message names the option at fault.
async fn connect(settings: &Settings) -> Result<Space, OpenError> {
    let space_option = settings.space.option();
    let options = ClientOptions::default();
    match &settings.space {
        SpaceName::Namespace(name) => {
            let volume_options = VolumeOptions { sessions: settings.sessions, client: options };
            match Volume::open(settings.target, name, volume_options).await {
                Ok(volume) => Ok(Space::Namespace(volume)),
                Err(error @ ClientError::NoSuchNamespace { .. }) => Err(OpenError::client(&space_option, error)),
                Err(error @ ClientError::Setting(_)) => Err(OpenError::new(libc::EINVAL, error.to_string())),
                Err(error) => Err(OpenError::client(&settings.target_option(), error)),
            }
        }
        SpaceName::Region(name) => {
            let mut sessions = Vec::with_capacity(settings.sessions);
            for _ in 0..settings.sessions {
                let session = AsyncClient::connect_with(settings.target, options).await;
                sessions.push(session.map_err(|error| OpenError::client(&settings.target_option(), error))?);
            }
            let info = sessions[0].region(name).map_err(|error| OpenError::client(&space_option, error))?.clone();
            Ok(Space::Region(Region { sessions, info, next: AtomicUsize::new(0) }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_the_errno_a_user_would_look_for() {
        let refused = |status| ClientError::Refused { opcode: 0x10, status };
        assert_eq!(errno_of(&refused(Status::OutOfRange)), libc::EINVAL);
        assert_eq!(errno_of(&refused(Status::NotSupported)), libc::EOPNOTSUPP);
        assert_eq!(errno_of(&refused(Status::IoError)), libc::EIO);
        assert_eq!(errno_of(&ClientError::TimedOut { attempts: 3 }), libc::ETIMEDOUT);
        assert_eq!(errno_of(&ClientError::NotListening("127.0.0.1:1".parse().unwrap())), libc::ECONNREFUSED);
        assert_eq!(errno_of(&ClientError::BeyondEnd { offset: 0, len: 1, size_bytes: 0 }), libc::EINVAL);
    }

    #[test]
    fn kinds_follow_the_c_abi() {
        let kinds: Vec<_> = (0..5).map(Kind::from_abi).collect();
        assert_eq!(kinds, vec![Some(Kind::Read), Some(Kind::Write), Some(Kind::Sync), Some(Kind::Trim), None]);
    }
}
