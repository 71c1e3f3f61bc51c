//! Every bound of the protocol and of the target in one place.
//!
//! A value here is either a hard protocol limit or the default of a validated setting. Pools are
//! sized from these at start-up and never grow: a full queue is back-pressure, not an allocation.

use crate::time::Duration;
use crate::wire::{HEADER_LEN, INSTRUCTION_HEADER_LEN, RESPONSE_INSTRUCTION_HEADER_LEN};

/// Largest UDP payload over IPv4 (65535 - 20 byte IP header - 8 byte UDP header).
pub const MAX_DATAGRAM_BYTES: usize = 65_507;

/// Smallest datagram size a peer may negotiate: enough for a HELLO answer listing every region.
pub const MIN_DATAGRAM_BYTES: usize = 4_096;

/// Default datagram size: one jumbo frame, which holds a VADD of 2048 f32 lanes with its result.
pub const DEFAULT_DATAGRAM_BYTES: usize = 9_000;

/// Instructions one datagram may carry.
pub const MAX_INSTRUCTIONS_PER_DATAGRAM: usize = 64;

/// Largest VADD operand: 2048 f32 lanes, the NetDAM Allreduce primitive.
pub const MAX_VADD_BYTES: usize = 2048 * 4;

/// Most bytes one ENCRYPT or DECRYPT addresses. AES-256-GCM runs at a few GB/s per core with
/// AES-NI, so 16 KiB holds a worker for a few microseconds, in line with a full VADD; the target
/// seals through a per-worker scratch buffer of this size (allocated at start-up).
pub const MAX_CRYPTO_BYTES: usize = 16 * 1024;

/// Most bytes one FILL, CRC32 or MEMCPY may address; the target answers `too_large` beyond it
/// (PROTOCOL.md, "Memory"). A worker runs each instruction to completion, answering nothing else
/// meanwhile: one FILL of 4 GiB held a worker 2.8 s, and a ping to the same worker waited 137 ms
/// behind a later one. A MiB is a fraction of a millisecond of work. This project's initiators
/// send longer ranges as several instructions (`Client::fill`, `crc32`, `memcpy`, the fio
/// engine's region trims, Allreduce's preparation).
pub const MAX_LONG_INSTRUCTION_BYTES: usize = 1 << 20;

/// Most associated-data bytes an ENCRYPT or DECRYPT operand may carry.
pub const MAX_CRYPTO_AAD_BYTES: usize = 1024;

/// Key slots a target holds: ENCRYPT's and DECRYPT's `aux` is a slot number below this.
pub const CRYPTO_KEY_SLOTS: u32 = 256;

/// Nonces a target reserves for a key slot at a time, by fsyncing the end of the block to the
/// slot's reservation file before it uses any of them. It reserves the next block when half of
/// the current one is used, so the fsync runs once per 64 Ki encryptions, with 32 Ki in hand.
pub const NONCE_RESERVATION_BLOCK: u64 = 1 << 16;

/// Bytes of memory one VADD exclusion flag covers: a VADD adds one such aligned chunk at a time
/// while holding its flag (see `compute`). 4 KiB (1024 f32 lanes) keeps a hold well under a
/// microsecond and a full 8 KiB VADD at 2 or 3 flag operations (1 KiB took 8 or 9, which cost
/// 75 ns of a 226 ns VADD in cache; docs/DECISIONS.md).
pub const VADD_CHUNK_BYTES: usize = 4096;

/// VADD exclusion flags, one cache line each (64 KiB in all): chunks share a flag only when
/// their addresses are this many chunks apart (a spurious wait, never a lost update).
pub const VADD_CHUNK_LOCKS: usize = 1024;

/// Regions (memory address spaces) one target serves.
pub const MAX_REGIONS: usize = 64;

/// Longest region name, in bytes of UTF-8.
pub const MAX_REGION_NAME_BYTES: usize = 32;

/// Entries a STAT answer may carry: room for every counter and status of the target with a
/// margin (80 entries of the longest name still fit the smallest datagram, asserted below).
pub const MAX_STAT_ENTRIES: usize = 80;

/// Longest STAT counter name.
pub const MAX_STAT_NAME_BYTES: usize = 40;

/// Worker threads one target runs.
pub const MAX_WORKERS: usize = 64;

/// Datagrams a worker takes from its socket in one pass (bounded work per loop pass).
pub const RECEIVE_BATCH: usize = 16;

/// Requests one initiator session keeps in flight.
pub const MAX_IN_FLIGHT: usize = 256;

/// Most sessions one target worker may be configured to hold (`sessions_per_worker`): session
/// ids carry the slot in their low 10 bits.
pub const MAX_SESSIONS_PER_WORKER: usize = 1024;

/// Fewest sessions per worker a target may be configured with.
pub const MIN_SESSIONS_PER_WORKER: usize = 16;

/// Sessions one worker holds unless configured otherwise.
pub const DEFAULT_SESSIONS_PER_WORKER: usize = 256;

/// Sessions one sender address (an IPv4 address, or an IPv6 /64) may hold per worker unless
/// configured otherwise (`max_sessions_per_address`): an eighth of the default table, so eight
/// hosts are needed to fill it, and a full table can still make room from the largest holder.
pub const DEFAULT_SESSIONS_PER_ADDRESS: usize = 32;

/// How long a session may stay silent before it expires, unless configured otherwise
/// (`session_idle_timeout_ms`).
pub const DEFAULT_SESSION_IDLE_TIMEOUT: Duration = Duration::from_millis(30_000);

/// Bounds of `session_idle_timeout_ms`.
pub const MIN_SESSION_IDLE_TIMEOUT: Duration = Duration::from_millis(1_000);
/// See [`MIN_SESSION_IDLE_TIMEOUT`].
pub const MAX_SESSION_IDLE_TIMEOUT: Duration = Duration::from_millis(86_400_000);

/// A session that has sent nothing since its HELLO expires after this: a HELLO replayed or
/// abandoned holds its slot no longer.
pub const UNUSED_SESSION_TIMEOUT: Duration = Duration::from_millis(1_000);

/// A session silent this long, with nothing in progress, is idle: it may give its slot to a
/// new session when the table (or its address's share) is full.
pub const SESSION_IDLE_BEFORE_EVICTION: Duration = Duration::from_millis(1_000);

/// How long a HELLO cookie stays valid after the target issued it: several retransmission
/// timeouts of the second HELLO, yet short enough that a captured cookie soon stops working.
pub const COOKIE_LIFETIME: Duration = Duration::from_millis(5_000);

/// Session slots a worker checks for expiry per sweep, and how often it sweeps: the whole of a
/// 1024-slot table every 64 ms, with bounded work in any one loop pass.
pub const SESSION_SWEEP_SLOTS: usize = 16;
/// See [`SESSION_SWEEP_SLOTS`].
pub const SESSION_SWEEP_INTERVAL: Duration = Duration::from_millis(1);

/// How long a request may wait for its block I/O before the target sends its initiator an
/// in-progress notice, and how long between notices after that (PROTOCOL.md, "In-progress
/// notices"): a quarter of the initiator's default floor of a block request's retransmission
/// timeout (20 ms), so that a notice arrives before that timer fires however slow the device
/// is, even when the worker loses its core for a while (10 ms left some resends when a disk
/// flush stalled the machine, 5 ms none; docs/DECISIONS.md), yet above this VM's disk's p99.9
/// at depth 32 (2–5 ms), so that a device working normally earns few.
pub const IN_PROGRESS_NOTICE_INTERVAL: Duration = Duration::from_millis(5);

/// How often a worker with block I/O in flight looks for requests due an in-progress notice:
/// a walk over its block slots (at most 64) once per millisecond, not once per pass.
pub const IN_PROGRESS_SCAN_INTERVAL: Duration = Duration::from_millis(1);

/// Sequences per session the target remembers: a request this far behind the newest one
/// executed is answered `stale`, never executed again.
pub const REPLAY_WINDOW: usize = 256;

/// Bytes per worker for stored answers of non-idempotent requests, replayed to retransmissions.
/// Written as a ring: an answer overwritten before its retransmission arrives makes that
/// retransmission `stale`.
pub const REPLAY_ARENA_BYTES: usize = 4 << 20;

/// Namespaces one target serves.
pub const MAX_NAMESPACES: usize = 64;

/// Datagrams with block instructions one worker holds while their I/O is in flight; past this,
/// a datagram with block instructions is answered `busy` without executing anything.
pub const PENDING_BLOCK_DATAGRAMS: usize = 64;

/// Largest block of a namespace. A block cannot be split between datagrams, so one block with
/// its BWRITE headers and an authentication trailer must fit in a datagram of the default size,
/// which is what initiators negotiate unless told otherwise.
pub const MAX_BLOCK_BYTES: u32 = 8192;

/// Block requests (and transfer buffers) one worker keeps in flight per namespace.
pub const BLOCK_QUEUE_DEPTH: u32 = 128;

/// Largest TRIM or WRITE_ZEROES one instruction may address, in bytes: a zeroed range on a
/// memory-backed namespace is written by the worker itself, so this bounds its pause.
pub const MAX_BLOCK_ZERO_BYTES: u64 = 64 << 20;

/// Most extents one BLOCK_STATUS answers: a file namespace finds each with two `lseek` calls
/// on the worker, so this bounds the worker's pause, and the answer (8 bytes an extent) fits
/// any datagram and the smallest transfer buffer (one 512-byte block).
pub const MAX_BLOCK_STATUS_EXTENTS: usize = 64;

// The window must cover every request a session may have in flight, or a retransmission of a
// request still in flight could be refused as stale.
const _: () = assert!(REPLAY_WINDOW >= MAX_IN_FLIGHT);
// Session ids: slot in bits 0..10, worker in bits 10..16, generation above.
const _: () = assert!(MAX_SESSIONS_PER_WORKER <= 1 << 10 && MAX_WORKERS <= 1 << 6);
const _: () = assert!(MIN_SESSIONS_PER_WORKER <= DEFAULT_SESSIONS_PER_WORKER);
const _: () = assert!(DEFAULT_SESSIONS_PER_WORKER <= MAX_SESSIONS_PER_WORKER);
// One address must not be able to fill the default table on its own.
const _: () = assert!(DEFAULT_SESSIONS_PER_ADDRESS < DEFAULT_SESSIONS_PER_WORKER);
// An unused session must expire before an idle one would, or replayed HELLOs would hold slots
// as long as real sessions.
const _: () = assert!(UNUSED_SESSION_TIMEOUT.as_nanos() <= MIN_SESSION_IDLE_TIMEOUT.as_nanos());
const _: () = assert!(MIN_SESSION_IDLE_TIMEOUT.as_nanos() <= DEFAULT_SESSION_IDLE_TIMEOUT.as_nanos());
const _: () = assert!(DEFAULT_SESSION_IDLE_TIMEOUT.as_nanos() <= MAX_SESSION_IDLE_TIMEOUT.as_nanos());
// The arena holds at least one full window of the largest answers.
const _: () = assert!(REPLAY_ARENA_BYTES >= 2 * MAX_DATAGRAM_BYTES);

// A datagram of the default size must carry the largest VADD with its request header, and its
// answer with the result (the Allreduce primitive must fit in one jumbo frame).
const _: () = assert!(HEADER_LEN + INSTRUCTION_HEADER_LEN + MAX_VADD_BYTES <= DEFAULT_DATAGRAM_BYTES);
const _: () = assert!(HEADER_LEN + RESPONSE_INSTRUCTION_HEADER_LEN + MAX_VADD_BYTES <= DEFAULT_DATAGRAM_BYTES);
const _: () = assert!(MIN_DATAGRAM_BYTES <= DEFAULT_DATAGRAM_BYTES);
// A chunk holds whole lanes of every type and whole 8-byte words (CAS and FETCH_ADD take the
// flag of one chunk), and the chunk copy lives on the worker's stack.
const _: () = assert!(VADD_CHUNK_BYTES.is_power_of_two() && VADD_CHUNK_BYTES >= 8 && VADD_CHUNK_BYTES <= 4096);
const _: () = assert!(DEFAULT_DATAGRAM_BYTES <= MAX_DATAGRAM_BYTES);
// A full instruction list must fit in the smallest datagram a peer may negotiate.
const _: () = assert!(HEADER_LEN + MAX_INSTRUCTIONS_PER_DATAGRAM * INSTRUCTION_HEADER_LEN <= MIN_DATAGRAM_BYTES);
// The HELLO answer lists every region in one datagram of the smallest negotiable size.
const _: () = assert!(
    HEADER_LEN
        + RESPONSE_INSTRUCTION_HEADER_LEN
        + crate::control::HELLO_ANSWER_FIXED_LEN
        + MAX_REGIONS * (crate::control::REGION_ENTRY_FIXED_LEN + MAX_REGION_NAME_BYTES)
        <= MIN_DATAGRAM_BYTES
);
// So does the STAT answer.
const _: () = assert!(
    HEADER_LEN + RESPONSE_INSTRUCTION_HEADER_LEN + 2 + MAX_STAT_ENTRIES * (1 + MAX_STAT_NAME_BYTES + 8)
        <= MIN_DATAGRAM_BYTES
);
// A full BLOCK_STATUS answer fits the smallest datagram a peer may negotiate, and the smallest
// transfer buffer the target keeps it in until the answer is written (one 512-byte block).
const _: () = assert!(
    HEADER_LEN + RESPONSE_INSTRUCTION_HEADER_LEN + MAX_BLOCK_STATUS_EXTENTS * crate::block::EXTENT_BYTES
        <= MIN_DATAGRAM_BYTES
);
const _: () = assert!(MAX_BLOCK_STATUS_EXTENTS * crate::block::EXTENT_BYTES <= 512);
// Region ids and counts travel as u16.
const _: () = assert!(MAX_REGIONS <= u16::MAX as usize);
const _: () = assert!(MAX_INSTRUCTIONS_PER_DATAGRAM <= u16::MAX as usize);
