//! One engine per fio thread, run on that thread alone: no runtime, no thread of its own, no
//! hand-over between threads. `submit` (fio's `queue`) splits an I/O into datagram-sized
//! instructions; `commit` (fio's `commit`) sends every instruction queued since the last one,
//! packing as many as fit into each datagram (so `iodepth_batch_submit=N` puts up to N I/Os in
//! one datagram, which halves the datagrams per I/O or better), and at depth lets a last datagram
//! with room wait briefly for fio's next I/O (`Coalescing`); `reap` (fio's `getevents`) hands
//! over what has finished, and reads the sessions' sockets when that is not enough (or requests
//! wait for room, or it has not read them for iodepth calls), spinning (`poll=busy`), sleeping
//! in `ppoll` (`poll=blocking`) or spinning only while an answer is due soon and sleeping after
//! (`poll=adaptive`); it copies read data straight from the answer into fio's buffer, and
//! completes an I/O when its last piece is answered. Retransmission, BUSY back-off and a HELLO
//! again after a target restart happen inside the sessions whenever `reap` reads the sockets,
//! which it does while anything is in flight.
//! A single instruction answered BUSY (its worker had no transfer buffer left, so it did not
//! execute) is the engine's to send again: the sessions see only their datagram answered
//! (`BusyHolds`).
//!
//! Measured against the first engine (a tokio runtime, a task per I/O and a channel to each
//! session's I/O task): see docs/DECISIONS.md, "The fio engine on fio's thread".

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::fmt;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use netdam_initiator::pieces::{pieces, zeroing_piece_bytes};
use netdam_initiator::volume::check_request;
use netdam_initiator::{Client, ClientError, ClientPoll, Op, Ticket};
use netdam_isa::control::{NamespaceInfo, RegionInfo};
use netdam_isa::limits::{BLOCK_QUEUE_DEPTH, MAX_LONG_INSTRUCTION_BYTES};
use netdam_isa::wire::{Instruction, HEADER_LEN, INSTRUCTION_HEADER_LEN, RESPONSE_INSTRUCTION_HEADER_LEN};
use netdam_isa::Status;

use crate::settings::{Settings, SpaceName};

/// I/O failures printed in full per engine; fio reports each failed I/O itself, so after these
/// only a count is printed (at close), rather than one line per I/O of a failing run.
const REPORTED_ERRORS_MAX: u32 = 8;

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
    /// What it asks for, where and how much: kept with the I/O in flight for messages.
    fn extent(&self) -> IoExtent {
        match self {
            Io::Read { offset, buffer } => IoExtent { kind: Kind::Read, offset: *offset, len: buffer.len() as u64 },
            Io::Write { offset, buffer } => IoExtent { kind: Kind::Write, offset: *offset, len: buffer.len() as u64 },
            Io::Sync => IoExtent { kind: Kind::Sync, offset: 0, len: 0 },
            Io::Trim { offset, len } => IoExtent { kind: Kind::Trim, offset: *offset, len: *len },
        }
    }
}

/// An I/O's kind, offset and length, for messages (built only when one is printed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct IoExtent {
    kind: Kind,
    offset: u64,
    len: u64,
}

impl IoExtent {
    /// `read`, `write`, `sync` or `trim`.
    fn name(&self) -> &'static str {
        match self.kind {
            Kind::Read => "read",
            Kind::Write => "write",
            Kind::Sync => "sync",
            Kind::Trim => "trim",
        }
    }

    /// A failure of this I/O, as printed after `netdam: namespace=disk: `: the I/O, then why,
    /// without repeating what the error's own message says of the I/O.
    fn failure(&self, error: &ClientError) -> String {
        match error {
            // `write of 4096 bytes at offset 61441: offsets and lengths must be multiples of ...`
            ClientError::Unaligned { .. } => error.to_string(),
            // `4096 bytes at offset 4194304 run past the end of the 4194304-byte namespace`
            ClientError::BeyondEnd { .. } => format!("{}: {error}", self.name()),
            _ => format!("{self}: {error}"),
        }
    }
}

impl fmt::Display for IoExtent {
    /// `write of 4096 bytes at offset 8192`, `trim of 65536 bytes at offset 0`, `sync`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Kind::Sync => f.write_str("sync"),
            _ => write!(f, "{} of {} bytes at offset {}", self.name(), self.len, self.offset),
        }
    }
}

/// Why the engine could not start: the errno fio records, and a message naming the option at
/// fault (`namespace=foo: the target has no namespace "foo" (it has, by name and id: disk (0))`).
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

impl IoBuffer {
    /// Wraps `len` bytes at `start`.
    ///
    /// # Safety
    /// Unless `len` is 0, `start` must be valid for reads and writes of `len` bytes, and nothing
    /// else may access them, until the I/O this buffer belongs to has completed.
    pub unsafe fn new(start: *mut u8, len: usize) -> IoBuffer {
        IoBuffer { start, len }
    }

    /// No buffer (a sync or a trim).
    pub fn empty() -> IoBuffer {
        IoBuffer { start: std::ptr::null_mut(), len: 0 }
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

/// fio's `io_u` for one I/O, handed back untouched: Rust never dereferences it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cookie(pub *mut c_void);

/// One finished I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// Which I/O.
    pub cookie: Cookie,
    /// 0, or the errno fio reports for it.
    pub errno: i32,
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
    let client = Client::connect_with(settings.target, settings.client_options())
        .map_err(|error| OpenError::client(settings.target_option(), error))?;
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

/// What fio's I/O addresses, and how its I/Os are cut into instructions.
#[derive(Debug)]
enum Space {
    /// A block namespace: BREAD/BWRITE of whole blocks, FLUSH, TRIM.
    Namespace {
        info: NamespaceInfo,
        /// Bytes one BREAD or BWRITE carries at most.
        transfer_bytes: u64,
    },
    /// A byte region: READ/WRITE, and FILL for a trim.
    Region { info: RegionInfo, read_chunk_bytes: u64, write_chunk_bytes: u64 },
}

/// Instructions one datagram carries at most: enough to pack a batch of small I/Os, few enough
/// that a lost datagram repeats little.
const PACK_MAX: usize = 16;

/// Coalescing holds a datagram with room only while at least this many other I/Os are
/// outstanding (on the wire, or answered and not yet reaped by fio): fio queues its next I/O as
/// soon as it reaps one of them, so that I/O is microseconds away, and the wait is small beside
/// the I/Os' latency (a depth of 32 queues ~100 µs); at lower depths every I/O goes out at once.
/// Answered I/Os count as much as those on the wire: where fio's own thread is the bound (a
/// target that answers at once), most of the depth waits to be reaped, few datagrams are on the
/// wire, and that is where sharing datagrams saves fio's thread the most system calls.
const HOLD_MIN_OUTSTANDING: usize = 8;

/// The longest a datagram with room waits for another I/O to share it.
const HOLD_MAX: Duration = Duration::from_micros(20);

/// The longest pause before a piece answered BUSY goes again, however often it was refused: a
/// worker's transfer buffers turn over within a device's latency (a millisecond or two when it
/// is loaded), and a longer pause would only stall the I/O (under the sessions' `max_rto` of 2 s
/// a piece that lost the race a dozen times waited a second, measured at depth 256 of 512-byte
/// writes). A refused piece costs the target an instruction header each time.
const BUSY_PAUSE_MAX: Duration = Duration::from_millis(5);

/// Whether the last datagram of the backlog may wait for more pieces (fio's `coalesce=`).
///
/// At depth, fio hands the engine one I/O per completion it reaps: with each sent at once, every
/// 4 KiB I/O costs a datagram each way, and on a machine whose cores the initiator and the
/// target share, per-datagram work is what bounds IOPS. Held until the next I/O arrives, two
/// 4 KiB I/Os share a datagram and its answer (Nagle's rule, with a bound: the hold ends when
/// fewer than `HOLD_MIN_OUTSTANDING` other I/Os are outstanding or after `HOLD_MAX`).
#[derive(Debug)]
struct Coalescing {
    enabled: bool,
    /// Since when a datagram with room has waited.
    held_since: Option<Instant>,
}

impl Coalescing {
    /// Whether the last, unfilled datagram may wait now, with `outstanding` other I/Os whose
    /// completions fio has yet to reap.
    fn may_hold(&mut self, outstanding: usize, now: impl FnOnce() -> Instant) -> bool {
        if !self.enabled || outstanding < HOLD_MIN_OUTSTANDING {
            self.held_since = None;
            return false;
        }
        let now = now();
        let since = *self.held_since.get_or_insert(now);
        if now.duration_since(since) >= HOLD_MAX {
            self.held_since = None;
            return false;
        }
        true
    }

    /// Nothing waits any more.
    fn released(&mut self) {
        self.held_since = None;
    }

    /// When a datagram waiting now must be sent.
    fn deadline(&self) -> Option<Instant> {
        self.held_since.map(|since| since + HOLD_MAX)
    }
}

/// A piece's BUSY answers in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BusyRecord {
    /// When the first of them arrived.
    first_at: Instant,
    /// How many.
    count: u32,
}

/// Pieces the target answered BUSY, each waiting to be sent again.
///
/// A worker answers BUSY for a single block instruction, and executes the rest of its datagram,
/// when it has no transfer buffer left for it (`BLOCK_QUEUE_DEPTH` per namespace): small block
/// I/Os packed up to `PACK_MAX` to a datagram outrun its buffers when several sessions (of this
/// job or others) share the worker; one session keeps within them (`Engine::transfers_max`).
/// The instruction did not execute, and every piece the engine sends may run again, so it is
/// sent again after a pause: a round trip at first (about what the worker takes to turn over
/// the buffers it holds), doubling with each BUSY the piece gets in a row, at most
/// `backoff_max` (`BUSY_PAUSE_MAX`). The sessions back off only a datagram answered BUSY as a
/// whole; an answered datagram is done for them. A piece still answered BUSY `patience` (the
/// sessions' `min_patience`) after its first BUSY fails.
#[derive(Debug)]
struct BusyHolds {
    /// The pieces and when each may go again; at most the pieces of iodepth I/Os.
    held: Vec<(Instant, Piece)>,
    /// The earliest of those times.
    next_due: Option<Instant>,
    backoff_max: Duration,
    patience: Duration,
}

impl BusyHolds {
    /// Room for `pieces` held at once without growing: fio's iodepth, one piece for each I/O of
    /// up to one transfer (a larger I/O's pieces may grow it, once).
    fn new(backoff_max: Duration, patience: Duration, pieces: usize) -> BusyHolds {
        BusyHolds { held: Vec::with_capacity(pieces), next_due: None, backoff_max, patience }
    }

    /// `piece` was answered BUSY at `now`, after a round trip of `rtt`: holds it to send again,
    /// or, once it has been refused for `patience`, gives back its record: it fails.
    fn hold(&mut self, mut piece: Piece, now: Instant, rtt: Duration) -> Result<(), BusyRecord> {
        let record = piece.busy.get_or_insert(BusyRecord { first_at: now, count: 0 });
        record.count += 1;
        if now.duration_since(record.first_at) >= self.patience {
            return Err(*record);
        }
        let doublings = (record.count - 1).min(16);
        let pause = rtt.max(Duration::from_micros(1)).saturating_mul(1 << doublings).min(self.backoff_max);
        let until = now + pause;
        self.next_due = Some(self.next_due.map_or(until, |due| due.min(until)));
        self.held.push((until, piece));
        Ok(())
    }

    /// When the next held piece may go again.
    fn deadline(&self) -> Option<Instant> {
        self.next_due
    }

    /// Moves the pieces whose pause has ended to the front of `backlog`: they are older than
    /// anything queued there.
    fn release_due(&mut self, now: Instant, backlog: &mut VecDeque<Piece>) {
        if self.next_due.is_none_or(|due| due > now) {
            return;
        }
        self.next_due = None;
        // Backwards, so that `swap_remove` only moves an element already looked at.
        let mut index = self.held.len();
        while index > 0 {
            index -= 1;
            let until = self.held[index].0;
            if until <= now {
                backlog.push_front(self.held.swap_remove(index).1);
            } else {
                self.next_due = Some(self.next_due.map_or(until, |due| due.min(until)));
            }
        }
    }
}

/// One instruction of an I/O, on the wire or waiting to be sent: the op without its operand,
/// which (a write's data) is given as a range of the I/O's buffer rather than copied.
#[derive(Debug, Clone)]
struct Piece {
    /// The I/O's slot.
    io: usize,
    /// The instruction; its operand is empty (see `operand`).
    op: Op,
    /// A write's data: (position, bytes) in the I/O's buffer.
    operand: Option<(usize, usize)>,
    /// For a read: where its data goes in fio's buffer, and how many bytes must come back.
    read_into: Option<(usize, usize)>,
    /// The BUSY answers it got in a row, if any (`BusyHolds`).
    busy: Option<BusyRecord>,
}

impl Piece {
    /// Bytes it takes in a request datagram.
    fn request_bytes(&self) -> usize {
        INSTRUCTION_HEADER_LEN + self.operand.map_or(0, |(_, len)| len)
    }

    /// Whether it carries data either way (a read's or a write's), for which a namespace's
    /// worker takes one of its transfer buffers.
    fn transfers(&self) -> bool {
        self.read_into.is_some() || self.operand.is_some()
    }

    /// Bytes its result takes in the answer.
    fn answer_bytes(&self) -> usize {
        RESPONSE_INSTRUCTION_HEADER_LEN + self.read_into.map_or(0, |(_, len)| len)
    }

    /// The instruction, its operand borrowed from `buffer` (the I/O's).
    fn instruction<'a>(&'a self, buffer: &'a [u8]) -> Instruction<'a> {
        let operand = self.operand.map_or(&[][..], |(position, len)| &buffer[position..position + len]);
        Instruction { operand, ..self.op.as_instruction() }
    }
}

/// The pieces one datagram carries, in instruction order.
#[derive(Debug)]
struct Batch {
    pieces: [Option<Piece>; PACK_MAX],
    len: usize,
}

impl Batch {
    fn new() -> Batch {
        Batch { pieces: std::array::from_fn(|_| None), len: 0 }
    }

    fn pieces(&self) -> impl Iterator<Item = &Piece> {
        self.pieces[..self.len].iter().flatten()
    }

    /// Its pieces that carry data (`Piece::transfers`).
    fn transfers(&self) -> usize {
        self.pieces().filter(|piece| piece.transfers()).count()
    }
}

/// The batches of the datagrams on the wire, each filled in place and kept where it is until
/// its answer: a batch is 2 KiB (`PACK_MAX` pieces), and moved by value (built, returned, into
/// the map, out of it) it was copied about seven times per datagram, 14 KiB of copying beside
/// a 4 KiB I/O's data (`docs/DECISIONS.md`, "The fio engine keeps its batches in place"). Each
/// batch holds a piece of an I/O in flight, so there are never more than the pieces in flight
/// (at most fio's iodepth times an I/O's pieces): it grows to that once.
#[derive(Debug, Default)]
struct Batches {
    batches: Vec<Batch>,
    free: Vec<usize>,
}

impl Batches {
    /// An empty batch to fill; its index.
    fn take(&mut self) -> usize {
        match self.free.pop() {
            Some(index) => index,
            None => {
                self.batches.push(Batch::new());
                self.batches.len() - 1
            }
        }
    }

    /// Moves the `len` pieces one datagram carries from the front of `backlog` into a free
    /// batch; the batch's index.
    fn fill_from(&mut self, backlog: &mut VecDeque<Piece>, len: usize) -> usize {
        let index = self.take();
        let batch = &mut self.batches[index];
        for place in batch.pieces.iter_mut().take(len) {
            *place = backlog.pop_front();
        }
        batch.len = len;
        index
    }

    /// Takes `index` back once its pieces are finished (taken out or dropped).
    fn give_back(&mut self, index: usize) {
        debug_assert!(!self.free.contains(&index), "batch {index} given back twice");
        let batch = &mut self.batches[index];
        batch.pieces[..batch.len].iter_mut().for_each(|place| *place = None);
        batch.len = 0;
        self.free.push(index);
    }

    /// Batch `index`.
    fn get(&self, index: usize) -> &Batch {
        &self.batches[index]
    }

    /// The piece at `position` of batch `index`, taken out of it.
    fn take_piece(&mut self, index: usize, position: usize) -> Option<Piece> {
        self.batches[index].pieces[position].take()
    }
}

/// How many pieces from the front of `backlog` one datagram of `max_datagram_bytes` carries
/// (at least one, when there are any), and whether they fill it: the next piece would not fit,
/// it holds `PACK_MAX`, or, with no next piece yet, one the size of its last would not fit (fio
/// jobs mostly use one block size, so waiting for the next I/O would not add it to this
/// datagram). One that does not fill is short only for want of pieces.
fn front_datagram(backlog: &VecDeque<Piece>, max_datagram_bytes: usize) -> (usize, bool) {
    let mut request_bytes = HEADER_LEN;
    let mut answer_bytes = HEADER_LEN;
    let mut len = 0;
    let fits = |request: usize, answer: usize, piece: &Piece| {
        request + piece.request_bytes() <= max_datagram_bytes && answer + piece.answer_bytes() <= max_datagram_bytes
    };
    for piece in backlog {
        if len == PACK_MAX || (len > 0 && !fits(request_bytes, answer_bytes, piece)) {
            return (len, true);
        }
        request_bytes += piece.request_bytes();
        answer_bytes += piece.answer_bytes();
        len += 1;
    }
    // Here `len` is the whole backlog: its last piece is the datagram's.
    let another_like_the_last = backlog.back().is_some_and(|last| fits(request_bytes, answer_bytes, last));
    (len, len == PACK_MAX || (len > 0 && !another_like_the_last))
}

/// A hasher for (session, ticket) keys: tickets are distinct counters, so a multiply mixes them
/// well enough, at a fraction of SipHash's cost per I/O.
#[derive(Debug, Default, Clone, Copy)]
struct TicketHasher(u64);

impl std::hash::Hasher for TicketHasher {
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.write_u64(u64::from(*byte));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type TicketMap<V> = HashMap<(usize, Ticket), V, std::hash::BuildHasherDefault<TicketHasher>>;

/// An I/O between `submit` and its completion.
#[derive(Debug)]
struct Slot {
    cookie: Cookie,
    /// What the I/O asks for, for messages.
    extent: IoExtent,
    /// fio's buffer (empty for a sync or trim).
    buffer: IoBuffer,
    /// Pieces not yet answered.
    remaining: usize,
    /// The first failure among its pieces.
    errno: i32,
}

/// The engine of one fio thread.
#[derive(Debug)]
pub struct Engine {
    sessions: Vec<Client>,
    space: Space,
    /// `namespace=disk` or `region=scratch`: the prefix of I/O error messages.
    option: String,
    /// How `reap` waits: spinning, sleeping in `ppoll`, or spinning until `spin_until` and then
    /// sleeping.
    poll: ClientPoll,
    /// Writes to a namespace carry FUA (fio's `sync=1`); fio once took the option and sent
    /// plain writes.
    fua: bool,
    /// I/Os in flight, by slot; at most fio's iodepth.
    slots: Vec<Option<Slot>>,
    free_slots: Vec<usize>,
    /// Datagrams on the wire, by session and ticket: the index of their batch in `batches`.
    on_wire: TicketMap<usize>,
    /// The pieces of each datagram on the wire.
    batches: Batches,
    /// Pieces carrying data on the wire, by session.
    transfers_on_wire: Vec<usize>,
    /// Most pieces carrying data one session has on the wire: on a namespace, the transfer
    /// buffers a target worker holds for it (`BLOCK_QUEUE_DEPTH`). A session's datagrams reach
    /// one worker, and past its buffers the worker answers BUSY for each instruction it has
    /// none for: 512-byte I/Os, 16 to a datagram, ran it out at depth 256. Holding them here
    /// instead is back-pressure; BUSY remains for sessions or jobs that share a worker.
    transfers_max: usize,
    /// Pieces queued and not yet sent (until `commit`, or waiting for room in a session's
    /// window), oldest first. Bounded by the I/Os admitted (at most iodepth) and their sizes.
    backlog: VecDeque<Piece>,
    /// Largest request and answer datagram, as HELLO negotiated.
    max_datagram_bytes: usize,
    /// Finished I/Os not yet reaped; at most iodepth.
    done: VecDeque<Completion>,
    /// Next session to try first (round robin).
    next_session: usize,
    /// I/Os that failed; the first few are printed in full.
    errors: u32,
    /// Session failures (a refused socket, a failed HELLO); the first few are printed.
    session_errors: u32,
    /// `ppoll`'s descriptors, one per session, kept so a wait allocates nothing.
    poll_fds: Vec<libc::pollfd>,
    coalescing: Coalescing,
    /// Pieces answered BUSY, until they are sent again.
    busy_holds: BusyHolds,
    /// `poll=adaptive`: the thread spins until then, and sleeps after.
    spin_until: Instant,
    /// The last `send_backlog` left pieces for want of room (a session's request limit, its
    /// share of the worker's transfer buffers, or its congestion window, which holds requests
    /// in the session): only answers make room.
    waiting_for_room: bool,
    /// `reap` calls in a row that did not read the sockets: at most iodepth.
    reads_skipped: usize,
}

impl Engine {
    /// Opens the sessions and finds the namespace or region; `iodepth` bounds the I/Os in
    /// flight. The message names the option at fault.
    pub fn open(settings: &Settings, iodepth: usize) -> Result<Engine, OpenError> {
        let iodepth = iodepth.max(1);
        let mut sessions = Vec::with_capacity(settings.sessions);
        for _ in 0..settings.sessions.max(1) {
            let session = Client::connect_with(settings.target, settings.client_options())
                .map_err(|error| OpenError::client(settings.target_option(), error))?;
            sessions.push(session);
        }
        let info = sessions[0].info();
        let space_option = settings.space.option();
        let space = match &settings.space {
            SpaceName::Namespace(name) => {
                let namespace = info.namespace(name).map_err(|error| OpenError::client(&space_option, error))?;
                let blocks = u64::from(info.blocks_per_transfer(namespace.block_bytes).max(1));
                Space::Namespace { info: namespace.clone(), transfer_bytes: blocks * u64::from(namespace.block_bytes) }
            }
            SpaceName::Region(name) => {
                let region = info.region(name).map_err(|error| OpenError::client(&space_option, error))?;
                Space::Region {
                    info: region.clone(),
                    read_chunk_bytes: info.read_chunk_bytes() as u64,
                    write_chunk_bytes: info.write_chunk_bytes() as u64,
                }
            }
        };
        let max_datagram_bytes = info.hello.max_datagram_bytes as usize;
        let session_config = settings.client_options().session;
        let poll_fds =
            sessions.iter().map(|session| libc::pollfd { fd: session.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        Ok(Engine {
            poll_fds: poll_fds.collect(),
            max_datagram_bytes,
            sessions,
            space,
            option: space_option,
            poll: settings.poll,
            slots: (0..iodepth).map(|_| None).collect(),
            free_slots: (0..iodepth).rev().collect(),
            on_wire: TicketMap::with_capacity_and_hasher(iodepth, Default::default()),
            batches: Batches::default(),
            transfers_on_wire: vec![0; settings.sessions.max(1)],
            transfers_max: match settings.space {
                SpaceName::Namespace(_) => BLOCK_QUEUE_DEPTH as usize,
                SpaceName::Region(_) => usize::MAX,
            },
            backlog: VecDeque::with_capacity(iodepth),
            done: VecDeque::with_capacity(iodepth),
            next_session: 0,
            errors: 0,
            session_errors: 0,
            coalescing: Coalescing { enabled: settings.coalesce, held_since: None },
            fua: settings.fua,
            busy_holds: BusyHolds::new(
                session_config.max_rto.to_std().min(BUSY_PAUSE_MAX),
                session_config.min_patience.to_std(),
                iodepth,
            ),
            spin_until: Instant::now(),
            waiting_for_room: false,
            reads_skipped: 0,
        })
    }

    /// Queues one I/O, to be sent by the next `commit` (or `reap`); its completion carries
    /// `cookie`. Fails (with an errno, and no completion to follow) only when fio exceeds the
    /// iodepth it gave at open.
    pub fn submit(&mut self, io: Io, cookie: Cookie) -> Result<(), i32> {
        let Some(slot) = self.free_slots.pop() else {
            eprintln!(
                "netdam: {}: more than iodepth={} I/Os submitted at once (a bug in the fio shim)",
                self.option,
                self.slots.len()
            );
            return Err(libc::EBUSY);
        };
        let queued = self.backlog.len();
        let extent = io.extent();
        if let Err(error) = self.queue_pieces(slot, &io) {
            self.backlog.truncate(queued);
            self.report(&extent.failure(&error));
            self.done.push_back(Completion { cookie, errno: errno_of(&error) });
            self.free_slots.push(slot);
            return Ok(());
        }
        let pieces = self.backlog.len() - queued;
        if pieces == 0 {
            // Nothing to send (a sync on a region, whose writes are durable when answered).
            self.done.push_back(Completion { cookie, errno: 0 });
            self.free_slots.push(slot);
            return Ok(());
        }
        let buffer = match io {
            Io::Read { buffer, .. } | Io::Write { buffer, .. } => buffer,
            Io::Sync | Io::Trim { .. } => IoBuffer::empty(),
        };
        self.slots[slot] = Some(Slot { cookie, extent, buffer, remaining: pieces, errno: 0 });
        Ok(())
    }

    /// Sends what `submit` queued (fio's `commit`), but for a last datagram with room that
    /// coalescing holds for the next I/O.
    pub fn commit(&mut self) {
        self.send_backlog();
        self.keep_spinning();
    }

    /// After a send or an answer: with `poll=adaptive` the thread spins a while longer.
    fn keep_spinning(&mut self) {
        if self.poll == ClientPoll::Adaptive {
            let spin = self.sessions.iter().map(Client::adaptive_spin).max().unwrap_or_default();
            self.spin_until = Instant::now() + spin.to_std();
        }
    }

    /// Cuts an I/O into instructions and queues them at the back of the backlog, each with the
    /// piece of the I/O it completes.
    fn queue_pieces(&mut self, io: usize, request: &Io) -> Result<(), ClientError> {
        let backlog = &mut self.backlog;
        let mut queue = |op: Op, operand: Option<(u64, u64)>, read_into: Option<(u64, u64)>| {
            debug_assert!(op.operand.is_empty(), "operands are given as ranges of the I/O's buffer");
            let range = |(position, len): (u64, u64)| (position as usize, len as usize);
            backlog.push_back(Piece {
                io,
                op,
                operand: operand.map(range),
                read_into: read_into.map(range),
                busy: None,
            });
        };
        match (&self.space, request) {
            (Space::Namespace { info, transfer_bytes }, request) => {
                let block = u64::from(info.block_bytes);
                let size_bytes = info.capacity_blocks * block;
                match request {
                    Io::Read { offset, buffer } => {
                        check_request("read", *offset, buffer.len() as u64, info.block_bytes, size_bytes)?;
                        for (at, position, len) in pieces(*offset, buffer.len() as u64, *transfer_bytes) {
                            queue(
                                Op::block_read(info.id, at / block, (len / block) as u32),
                                None,
                                Some((position, len)),
                            );
                        }
                    }
                    Io::Write { offset, buffer } => {
                        check_request("write", *offset, buffer.len() as u64, info.block_bytes, size_bytes)?;
                        for (at, position, len) in pieces(*offset, buffer.len() as u64, *transfer_bytes) {
                            // The operand (the data) is added as a range of fio's buffer.
                            let op = Op::block_write(info.id, at / block, info.block_bytes, &[], self.fua);
                            queue(Op { length: (len / block) as u32, ..op }, Some((position, len)), None);
                        }
                    }
                    Io::Sync => queue(Op::flush(info.id), None, None),
                    Io::Trim { offset, len } => {
                        check_request("trim", *offset, *len, info.block_bytes, size_bytes)?;
                        for (at, _, piece) in pieces(*offset, *len, zeroing_piece_bytes(info.block_bytes)) {
                            queue(Op::trim(info.id, at / block, (piece / block) as u32), None, None);
                        }
                    }
                }
            }
            (Space::Region { info, read_chunk_bytes, write_chunk_bytes }, request) => match request {
                Io::Read { offset, buffer } => {
                    for (at, position, len) in pieces(*offset, buffer.len() as u64, *read_chunk_bytes) {
                        queue(Op::read(info.id, at, len as u32), None, Some((position, len)));
                    }
                }
                Io::Write { offset, buffer } => {
                    for (at, position, len) in pieces(*offset, buffer.len() as u64, *write_chunk_bytes) {
                        // The operand (the data) is added as a range of fio's buffer.
                        let op = Op { length: len as u32, ..Op::write(info.id, at, &[]) };
                        queue(op, Some((position, len)), None);
                    }
                }
                // A region acknowledges a write once it is as durable as the region can make it
                // (persisted, on a persistent region): a sync has nothing left to wait for.
                Io::Sync => {}
                // Zeroed with FILL, in pieces that hold a target worker a fraction of a
                // millisecond each (a worker runs each instruction to completion).
                Io::Trim { offset, len } => {
                    for (at, _, piece) in pieces(*offset, *len, MAX_LONG_INSTRUCTION_BYTES as u64) {
                        queue(Op::fill(info.id, at, piece as u32, 0), None, None);
                    }
                }
            },
        }
        Ok(())
    }

    /// Sends waiting pieces, oldest first, on whichever sessions have room, starting with the
    /// one after the last used, so that several sessions share the load. Consecutive pieces go
    /// in one datagram while their requests and their answers fit the negotiated size.
    fn send_backlog(&mut self) {
        self.waiting_for_room = false;
        let count = self.sessions.len();
        'datagrams: while !self.backlog.is_empty() {
            let (len, full) = front_datagram(&self.backlog, self.max_datagram_bytes);
            // The I/Os outstanding besides those waiting here (a piece counted as an I/O: fewer
            // others, never more).
            let outstanding = self.in_flight().saturating_sub(self.backlog.len());
            if !full && self.coalescing.may_hold(outstanding, Instant::now) {
                break;
            }
            let transfers = self.backlog.iter().take(len).filter(|piece| piece.transfers()).count();
            for step in 0..count {
                let index = (self.next_session + step) % count;
                // A datagram with more pieces than the limit still goes, alone.
                let on_wire = self.transfers_on_wire[index];
                if !self.sessions[index].has_room() || (on_wire > 0 && on_wire + transfers > self.transfers_max) {
                    continue;
                }
                let batch_index = self.batches.fill_from(&mut self.backlog, len);
                self.next_session = (index + 1) % count;
                let (slots, pieces) = (&self.slots, &self.batches.get(batch_index).pieces);
                let instruction = |position: usize| {
                    let piece = pieces[position].as_ref().expect("a batch is filled from its start");
                    let buffer = slots[piece.io].as_ref().map_or(&[][..], |slot| slot.buffer.as_slice());
                    piece.instruction(buffer)
                };
                match self.sessions[index].enqueue_with(len, instruction) {
                    Ok(ticket) => {
                        self.transfers_on_wire[index] += transfers;
                        self.on_wire.insert((index, ticket), batch_index);
                    }
                    Err(error) => self.fail_batch(batch_index, &error),
                }
                continue 'datagrams;
            }
            // Every window, or every session's share of its worker's transfer buffers, is full:
            // the rest waits for answers.
            self.waiting_for_room = true;
            break;
        }
        // What each session took leaves in one train (a batch of fio's I/Os, or the refill
        // after a reap), one system call for all of it. What a session's congestion window holds
        // back waits for answers as well.
        for session in &mut self.sessions {
            session.send_enqueued();
            self.waiting_for_room |= session.has_queued();
        }
        if self.backlog.is_empty() {
            self.coalescing.released();
        }
    }

    /// Fails every piece of batch `index` with `error`, and frees the batch.
    fn fail_batch(&mut self, index: usize, error: &ClientError) {
        for position in 0..self.batches.get(index).len {
            if let Some(piece) = self.batches.take_piece(index, position) {
                self.finish_piece(&piece, Err(error.duplicate()));
            }
        }
        self.batches.give_back(index);
    }

    /// Reads what the sessions received, handles their timeouts, finishes pieces, and sends
    /// what waits. Never blocks.
    fn turn(&mut self) {
        let mut answered = false;
        for index in 0..self.sessions.len() {
            if let Err(error) = self.sessions[index].progress() {
                self.report_session_error(index, &error);
            }
            while let Some((ticket, result)) = self.sessions[index].take_finished() {
                answered = true;
                let Some(batch_index) = self.on_wire.remove(&(index, ticket)) else { continue };
                self.transfers_on_wire[index] -= self.batches.get(batch_index).transfers();
                match result {
                    Ok(reply) => {
                        for position in 0..self.batches.get(batch_index).len {
                            let Some(piece) = self.batches.take_piece(batch_index, position) else { continue };
                            match reply.data(position) {
                                Err(error @ ClientError::Refused { status: Status::Busy, .. }) => {
                                    self.hold_busy(piece, reply.rtt.to_std(), &error)
                                }
                                result => self.finish_piece(&piece, result),
                            }
                        }
                        self.sessions[index].recycle(reply);
                        self.batches.give_back(batch_index);
                    }
                    Err(error) => self.fail_batch(batch_index, &error),
                }
            }
        }
        self.send_due();
        if answered {
            self.keep_spinning();
        }
    }

    /// Sends what waits: pieces whose BUSY pause has ended, and the backlog.
    fn send_due(&mut self) {
        if self.busy_holds.deadline().is_some() {
            self.busy_holds.release_due(Instant::now(), &mut self.backlog);
        }
        self.send_backlog();
    }

    /// The target answered BUSY for `piece` alone (`error`): it goes again after a pause, or
    /// fails its I/O once the target has refused it for the sessions' patience.
    fn hold_busy(&mut self, piece: Piece, rtt: Duration, error: &ClientError) {
        let now = Instant::now();
        let io = piece.io;
        let Err(record) = self.busy_holds.hold(piece, now, rtt) else { return };
        let waited = now.duration_since(record.first_at);
        self.fail_io(io, libc::EBUSY, |extent| {
            format!(
                "{extent}: {error}, {} times in a row over {:.1} s (the target's worker has no transfer \
                 buffer free for it: it is overloaded; fewer I/Os in flight, a lower iodepth=, would help)",
                record.count,
                waited.as_secs_f64()
            )
        });
        self.piece_done(io);
    }

    /// A session's socket failed (the target refuses, or the network is gone). Its pieces are
    /// not failed here: their requests live on in the session, which retransmits them (and
    /// says HELLO again to a restarted target) until they are answered or time out, and an I/O
    /// reported failed must never land afterwards.
    fn report_session_error(&mut self, index: usize, error: &ClientError) {
        if self.session_errors < REPORTED_ERRORS_MAX {
            eprintln!(
                "netdam: {}: session {index}: {error} (its requests are retried until they time out)",
                self.option
            );
        }
        self.session_errors += 1;
    }

    /// Takes a piece's answer (its result's data): a read's data goes into fio's buffer; the
    /// I/O completes with its last piece.
    fn finish_piece(&mut self, piece: &Piece, result: Result<&[u8], ClientError>) {
        let Some(slot) = self.slots[piece.io].as_mut() else { return };
        let outcome = result.and_then(|data| {
            if let Some((position, len)) = piece.read_into {
                if data.len() != len {
                    return Err(ClientError::MissingResult(0));
                }
                slot.buffer.as_mut_slice()[position..position + len].copy_from_slice(data);
            }
            Ok(())
        });
        if let Err(error) = outcome {
            self.fail_io(piece.io, errno_of(&error), |extent| extent.failure(&error));
        }
        self.piece_done(piece.io);
    }

    /// Records the first failure of an I/O (its errno, and `message`, printed while few have
    /// been); the I/O completes with its last piece, carrying that errno.
    fn fail_io(&mut self, io: usize, errno: i32, message: impl FnOnce(IoExtent) -> String) {
        let Some(slot) = self.slots[io].as_mut() else { return };
        if slot.errno == 0 {
            slot.errno = errno;
            let message = message(slot.extent);
            self.report(&message);
        }
    }

    /// One more piece of I/O `io` is answered (or has failed): the last completes it.
    fn piece_done(&mut self, io: usize) {
        let Some(slot) = self.slots[io].as_mut() else { return };
        slot.remaining -= 1;
        if slot.remaining == 0 {
            let slot = self.slots[io].take().expect("the slot was just used");
            self.done.push_back(Completion { cookie: slot.cookie, errno: slot.errno });
            self.free_slots.push(io);
        }
    }

    /// Prints the first few failures in full (fio prints only an errno per I/O).
    fn report(&mut self, message: &str) {
        if self.errors < REPORTED_ERRORS_MAX {
            eprintln!("netdam: {}: {message}", self.option);
        }
        self.errors += 1;
    }

    /// I/Os submitted and not yet reaped.
    fn in_flight(&self) -> usize {
        self.slots.len() - self.free_slots.len() + self.done.len()
    }

    /// Waits for at least `min` completions (no more than are in flight) until `timeout`
    /// (`None`: no limit), and hands up to `max` to `sink`. Returns how many.
    pub fn reap(
        &mut self,
        min: usize,
        max: usize,
        timeout: Option<Duration>,
        mut sink: impl FnMut(Completion),
    ) -> usize {
        // Waiting for more than are in flight would wait forever.
        let min = min.min(self.in_flight()).min(max);
        let deadline = timeout.map(|timeout| Instant::now() + timeout);
        loop {
            // With enough finished already, the sockets are not read: at depth fio reaps one
            // completion per call while the target answers faster than fio takes them, and a
            // read of an empty socket per call costs fio's thread a system call per I/O. Unless
            // requests wait for room, which only the answers in the socket make; and at least
            // once per iodepth calls, so that the sessions' timers run even while completions
            // that need no answer (a sync on a region, an I/O refused at `submit`) keep `done`
            // from emptying.
            let must_read =
                self.done.len() < min.max(1) || self.waiting_for_room || self.reads_skipped >= self.slots.len();
            if must_read {
                self.reads_skipped = 0;
                self.turn();
            } else {
                self.reads_skipped += 1;
                self.send_due();
            }
            if self.done.len() >= min {
                break;
            }
            let spins = match self.poll {
                ClientPoll::Busy => true,
                ClientPoll::Adaptive => Instant::now() < self.spin_until,
                ClientPoll::Blocking => false,
            };
            if spins {
                if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                    break;
                }
                std::hint::spin_loop();
            } else if !self.sleep(deadline) {
                break;
            }
        }
        let mut taken = 0;
        while taken < max {
            let Some(completion) = self.done.pop_front() else { break };
            sink(completion);
            taken += 1;
        }
        taken
    }

    /// Sleeps until a session's socket is readable, a session's timer is due, or `deadline`;
    /// false when `deadline` has passed.
    fn sleep(&mut self, deadline: Option<Instant>) -> bool {
        let now = Instant::now();
        let until_deadline = match deadline {
            Some(deadline) if deadline <= now => return false,
            Some(deadline) => Some(deadline - now),
            None => None,
        };
        let timers = self.sessions.iter().filter_map(Client::time_to_deadline);
        // A datagram held for coalescing goes out when its hold ends, asleep or not.
        let hold = self.coalescing.deadline().map(|deadline| deadline.saturating_duration_since(now));
        // So does a piece answered BUSY when its pause ends.
        let busy = self.busy_holds.deadline().map(|deadline| deadline.saturating_duration_since(now));
        let wait = timers.chain(until_deadline).chain(hold).chain(busy).min();
        let timespec = wait.map(|wait| libc::timespec {
            tv_sec: wait.as_secs().min(i32::MAX as u64) as libc::time_t,
            tv_nsec: libc::c_long::from(wait.subsec_nanos() as i32),
        });
        let timeout = timespec.as_ref().map_or(std::ptr::null(), |timespec| timespec as *const libc::timespec);
        // SAFETY: `poll_fds` holds one initialised pollfd per session; `timeout` is NULL or
        // points at a live timespec; no signal mask is changed.
        unsafe {
            libc::ppoll(self.poll_fds.as_mut_ptr(), self.poll_fds.len() as libc::nfds_t, timeout, std::ptr::null())
        };
        true
    }

    /// Closes the sessions (each says CLOSE, so the target frees its slot at once, waiting at
    /// most 100 ms for its confirmation). I/Os still in flight are abandoned.
    pub fn close(self) {
        if self.errors > REPORTED_ERRORS_MAX {
            eprintln!("netdam: {}: {} I/Os failed in all ({REPORTED_ERRORS_MAX} shown)", self.option, self.errors);
        }
        drop(self.sessions);
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
            Status::PermissionDenied | Status::Unauthenticated => libc::EACCES,
            Status::Busy => libc::EBUSY,
            _ => libc::EIO,
        },
        ClientError::TimedOut { .. } | ClientError::OutcomeUnknown { .. } => libc::ETIMEDOUT,
        ClientError::NotListening(_) => libc::ECONNREFUSED,
        ClientError::Closed => libc::ESHUTDOWN,
        ClientError::NoSuchNamespace { .. } | ClientError::NoSuchRegion { .. } => libc::ENOENT,
        ClientError::Setting(_) => libc::EINVAL,
        // Refused for want of proof of the tenant's key, as `PermissionDenied` for want of a
        // permission; a full session table (`busy`, `session_limit`) is a busy target.
        ClientError::HelloRefused(Status::Unauthenticated) => libc::EACCES,
        ClientError::HelloRefused(_) | ClientError::SessionLimit { .. } => libc::EBUSY,
        _ => libc::EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_piece(io: usize, bytes: u64) -> Piece {
        Piece {
            io,
            op: Op::block_read(0, 0, (bytes / 4096) as u32),
            operand: None,
            read_into: Some((0, bytes as usize)),
            busy: None,
        }
    }

    #[test]
    fn a_datagram_fills_when_the_next_piece_or_one_like_its_last_would_not_fit_or_it_holds_pack_max() {
        let mut backlog = VecDeque::new();
        assert_eq!(front_datagram(&backlog, 9000), (0, false));
        backlog.push_back(read_piece(0, 4096));
        assert_eq!(front_datagram(&backlog, 9000), (1, false), "room for a second 4 KiB answer");
        backlog.push_back(read_piece(1, 4096));
        assert_eq!(
            front_datagram(&backlog, 9000),
            (2, true),
            "two 4 KiB answers fit 9000 bytes, and a third of their size would not: no wait for it"
        );
        backlog.push_back(read_piece(2, 4096));
        assert_eq!(front_datagram(&backlog, 9000), (2, true), "a third does not: the first two fill it");
        backlog.clear();
        backlog.push_back(read_piece(0, 4096));
        backlog.push_back(read_piece(1, 512));
        assert_eq!(front_datagram(&backlog, 9000), (2, false), "room for another 512-byte answer");
        backlog.push_back(read_piece(2, 8192));
        assert_eq!(front_datagram(&backlog, 9000), (2, true), "the next does not fit");
        assert_eq!(front_datagram(&backlog, 4400), (1, true), "one 4 KiB answer per small datagram");
        let mut small: VecDeque<Piece> = (0..PACK_MAX + 1)
            .map(|io| Piece { io, op: Op::flush(0), operand: None, read_into: None, busy: None })
            .collect();
        assert_eq!(front_datagram(&small, 9000), (PACK_MAX, true));
        small.pop_back();
        assert_eq!(front_datagram(&small, 9000), (PACK_MAX, true), "PACK_MAX pieces fill it with nothing after");
        let oversized: VecDeque<Piece> = [read_piece(0, 16384)].into_iter().collect();
        assert_eq!(front_datagram(&oversized, 9000), (1, true), "a piece larger than a datagram goes alone, at once");
    }

    #[test]
    fn a_batch_is_filled_in_place_and_reused_once_its_answer_is_taken() {
        let mut batches = Batches::default();
        let mut backlog: VecDeque<Piece> = (3..6).map(|io| read_piece(io, 4096)).collect();
        let first = batches.fill_from(&mut backlog, 2);
        let ios = |batches: &Batches, index: usize| -> Vec<usize> {
            batches.get(index).pieces().map(|piece| piece.io).collect()
        };
        assert_eq!(ios(&batches, first), vec![3, 4], "the front of the backlog, in order");
        assert_eq!(backlog.iter().map(|piece| piece.io).collect::<Vec<_>>(), vec![5]);
        let second = batches.fill_from(&mut backlog, 1);
        assert_ne!(first, second, "a batch on the wire is not handed out again");
        assert_eq!(batches.take_piece(first, 1).map(|piece| piece.io), Some(4));
        batches.give_back(first);
        // The answered batch comes back empty, and the slab does not grow for it.
        assert_eq!(batches.take(), first);
        assert_eq!(batches.batches.len(), 2);
        assert_eq!(batches.get(first).len, 0);
        assert!(batches.get(first).pieces.iter().all(Option::is_none), "no piece of the last datagram is left");
        assert_eq!(ios(&batches, second), vec![5], "the other batch keeps its piece");
    }

    #[test]
    fn coalescing_holds_only_at_depth_and_never_longer_than_its_bound() {
        let start = Instant::now();
        let mut off = Coalescing { enabled: false, held_since: None };
        assert!(!off.may_hold(32, || start), "coalesce=0 never holds");
        let mut on = Coalescing { enabled: true, held_since: None };
        assert!(!on.may_hold(HOLD_MIN_OUTSTANDING - 1, || start), "too few outstanding: send now");
        assert_eq!(on.deadline(), None);
        assert!(on.may_hold(HOLD_MIN_OUTSTANDING, || start));
        assert_eq!(on.deadline(), Some(start + HOLD_MAX));
        // The hold counts from its start, not from each look.
        assert!(on.may_hold(32, || start + HOLD_MAX / 2));
        assert!(!on.may_hold(32, || start + HOLD_MAX), "the bound has passed: send");
        assert_eq!(on.deadline(), None, "and the next hold starts afresh");
        assert!(on.may_hold(32, || start + HOLD_MAX));
        on.released();
        assert_eq!(on.deadline(), None);
    }

    #[test]
    fn errors_map_to_the_errno_a_user_would_look_for() {
        let refused = |status| ClientError::Refused { opcode: 0x10, status };
        assert_eq!(errno_of(&refused(Status::OutOfRange)), libc::EINVAL);
        assert_eq!(errno_of(&refused(Status::NotSupported)), libc::EOPNOTSUPP);
        assert_eq!(errno_of(&refused(Status::IoError)), libc::EIO);
        assert_eq!(errno_of(&ClientError::TimedOut { attempts: 3 }), libc::ETIMEDOUT);
        assert_eq!(errno_of(&ClientError::NotListening("127.0.0.1:1".parse().unwrap())), libc::ECONNREFUSED);
        assert_eq!(errno_of(&ClientError::BeyondEnd { offset: 0, len: 1, size_bytes: 0 }), libc::EINVAL);
        // A tenant key the target does not accept is a permission problem, not a busy target.
        assert_eq!(errno_of(&ClientError::HelloRefused(Status::Unauthenticated)), libc::EACCES);
        assert_eq!(errno_of(&ClientError::DatagramRefused(Status::Unauthenticated)), libc::EACCES);
        assert_eq!(errno_of(&refused(Status::PermissionDenied)), libc::EACCES);
        assert_eq!(errno_of(&ClientError::HelloRefused(Status::Busy)), libc::EBUSY);
        assert_eq!(errno_of(&ClientError::HelloRefused(Status::SessionLimit)), libc::EBUSY);
        let limit = ClientError::SessionLimit { kind: netdam_isa::control::SessionLimitKind::Address, limit: 32 };
        assert_eq!(errno_of(&limit), libc::EBUSY);
    }

    #[test]
    fn a_failed_io_is_named_once_by_kind_length_and_offset() {
        let trim = Io::Trim { offset: 8192, len: 65536 }.extent();
        let refused = ClientError::Refused { opcode: netdam_isa::Opcode::Trim as u8, status: Status::IoError };
        assert_eq!(trim.failure(&refused), format!("trim of 65536 bytes at offset 8192: {refused}"));
        assert_eq!(Io::Sync.extent().failure(&ClientError::TimedOut { attempts: 8 }).split(':').next(), Some("sync"));
        let mut data = [0u8; 4096];
        // SAFETY: `data` outlives the I/O, which is never submitted.
        let write = Io::Write { offset: 61441, buffer: unsafe { IoBuffer::new(data.as_mut_ptr(), data.len()) } };
        let unaligned =
            ClientError::Unaligned { what: "write".to_string(), offset: 61441, len: 4096, block_bytes: 4096 };
        assert_eq!(write.extent().failure(&unaligned), unaligned.to_string(), "the error names the write already");
        assert!(unaligned.to_string().starts_with("write of 4096 bytes at offset 61441: "));
        let beyond = ClientError::BeyondEnd { offset: 61441, len: 4096, size_bytes: 4096 };
        assert_eq!(write.extent().failure(&beyond), format!("write: {beyond}"));
    }

    fn busy_holds() -> BusyHolds {
        BusyHolds::new(Duration::from_millis(2), Duration::from_secs(5), 4)
    }

    #[test]
    fn a_piece_answered_busy_goes_again_after_a_round_trip_doubling_up_to_the_cap() {
        let start = Instant::now();
        let rtt = Duration::from_micros(100);
        let mut holds = busy_holds();
        let mut backlog = VecDeque::new();
        backlog.push_back(read_piece(9, 4096));
        assert_eq!(holds.hold(read_piece(1, 4096), start, rtt), Ok(()));
        assert_eq!(holds.deadline(), Some(start + rtt), "the first pause is a round trip");
        holds.release_due(start + rtt / 2, &mut backlog);
        assert_eq!(backlog.len(), 1, "not before its pause ends");
        holds.release_due(start + rtt, &mut backlog);
        assert_eq!(holds.deadline(), None);
        let released = backlog.pop_front().expect("released to the front");
        assert_eq!((released.io, released.busy.map(|record| record.count)), (1, Some(1)));
        // Refused again and again: each pause twice the last, up to the cap.
        let mut piece = released;
        let mut now = start + rtt;
        let mut pauses = Vec::new();
        for _ in 0..6 {
            holds.hold(piece, now, rtt).expect("within patience");
            let due = holds.deadline().expect("held");
            pauses.push(due - now);
            holds.release_due(due, &mut backlog);
            piece = backlog.pop_front().expect("released");
            now = due;
        }
        let micros: Vec<u128> = pauses.iter().map(Duration::as_micros).collect();
        assert_eq!(micros, vec![200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(piece.busy.map(|record| (record.first_at, record.count)), Some((start, 7)));
        assert_eq!(backlog.front().map(|piece| piece.io), Some(9), "what was queued stays behind");
    }

    #[test]
    fn a_piece_still_busy_after_the_patience_fails() {
        let start = Instant::now();
        let mut holds = busy_holds();
        let mut backlog = VecDeque::new();
        holds.hold(read_piece(1, 512), start, Duration::from_micros(50)).unwrap();
        holds.release_due(start + Duration::from_secs(1), &mut backlog);
        let piece = backlog.pop_front().unwrap();
        holds.hold(piece, start + Duration::from_secs(4), Duration::from_micros(50)).unwrap();
        holds.release_due(start + Duration::from_secs(5), &mut backlog);
        let piece = backlog.pop_front().unwrap();
        assert_eq!(
            holds.hold(piece, start + Duration::from_secs(5), Duration::from_micros(50)),
            Err(BusyRecord { first_at: start, count: 3 }),
            "five seconds after its first BUSY it is not held again"
        );
        assert_eq!(holds.deadline(), None);
    }

    #[test]
    fn held_pieces_are_released_each_when_due() {
        let start = Instant::now();
        let mut holds = busy_holds();
        for (io, rtt_us) in [(1, 300), (2, 100), (3, 200)] {
            holds.hold(read_piece(io, 512), start, Duration::from_micros(rtt_us)).unwrap();
        }
        assert_eq!(holds.deadline(), Some(start + Duration::from_micros(100)));
        let mut backlog = VecDeque::new();
        holds.release_due(start + Duration::from_micros(200), &mut backlog);
        let mut released: Vec<usize> = backlog.iter().map(|piece| piece.io).collect();
        released.sort();
        assert_eq!(released, vec![2, 3]);
        assert_eq!(holds.deadline(), Some(start + Duration::from_micros(300)));
        holds.release_due(start + Duration::from_micros(300), &mut backlog);
        assert_eq!((backlog.len(), holds.deadline()), (3, None));
    }

    #[test]
    fn kinds_follow_the_c_abi() {
        let kinds: Vec<_> = (0..5).map(Kind::from_abi).collect();
        assert_eq!(kinds, vec![Some(Kind::Read), Some(Kind::Write), Some(Kind::Sync), Some(Kind::Trim), None]);
    }
}
