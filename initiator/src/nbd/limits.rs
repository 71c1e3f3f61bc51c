//! Every bound of the NBD export in one place: hard limits against misbehaving clients, and the
//! defaults of [`crate::nbd::ExportOptions`]. Memory a connection may hold is bounded by these,
//! so a client that floods the server meets back-pressure, never an allocation it chose.

use std::time::Duration;

/// Longest string the protocol allows (export names, descriptions, error messages, queries).
pub const MAX_STRING_BYTES: usize = 4096;

/// Longest option payload the server reads during the handshake. The largest legitimate option
/// is a meta-context request naming an export and a few queries (each at most
/// [`MAX_STRING_BYTES`]); anything longer is refused and the connection closed before the
/// payload is read, so a client cannot make the server allocate what its header claims.
pub const MAX_OPTION_BYTES: u32 = 64 * 1024;

/// Options one client may send before it is disconnected. Real clients send fewer than ten
/// (qemu: extended headers or structured replies, a meta context, GO; libnbd a few more).
pub const MAX_OPTIONS: u32 = 128;

/// Queries one meta-context option may carry (each at least 4 bytes, so the option bound
/// already caps them; this keeps the parsed list small as well).
pub const MAX_META_CONTEXT_QUERIES: usize = 256;

/// The payload size every NBD client may assume without negotiation (the spec's default
/// maximum), and the default maximum the export advertises.
pub const DEFAULT_MAX_PAYLOAD_BYTES: u32 = 32 * 1024 * 1024;

/// Largest request payload the server reads at all. A write (or an extended-header payload)
/// longer than this is treated as a denial-of-service attempt and the connection is closed; the
/// spec says payloads up to 32 MiB must not be treated so, hence the floor.
pub const MAX_PAYLOAD_READ_BYTES: u64 = 64 * 1024 * 1024;

/// Largest maximum payload an export may advertise: a payload the server is willing to read.
pub const MAX_ADVERTISED_PAYLOAD_BYTES: u32 = MAX_PAYLOAD_READ_BYTES as u32;

/// Largest minimum block size the protocol allows (`NBD_INFO_BLOCK_SIZE`).
pub const MAX_MIN_BLOCK_BYTES: u32 = 64 * 1024;

/// Default bound on simultaneous connections; further clients wait in the listen backlog.
pub const DEFAULT_MAX_CONNECTIONS: usize = 16;

/// Default requests one connection may have in flight before the server stops reading it.
pub const DEFAULT_MAX_IN_FLIGHT_PER_CONNECTION: usize = 64;

/// Default bytes of request and reply data one connection may hold in memory at once.
pub const DEFAULT_MAX_IN_FLIGHT_BYTES_PER_CONNECTION: usize = 64 * 1024 * 1024;

/// Largest per-connection data budget: the budget is a semaphore counted in `u32` permits.
pub const MAX_IN_FLIGHT_BYTES_PER_CONNECTION: usize = u32::MAX as usize;

/// Default time a client has to finish the handshake; a silent client would otherwise hold a
/// connection slot forever. qemu-nbd uses the same 10 s.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Default time connections get to finish their in-flight requests at shutdown before they are
/// closed regardless.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long after the stop a connection, its requests done, keeps answering the client's next
/// requests `NBD_ESHUTDOWN` (and waits for its disconnect) before it closes. Counted from the
/// stop, not restarted by each request; the drain timeout bounds what is in flight.
pub const SHUTDOWN_QUIET: Duration = Duration::from_millis(200);

/// Bytes the connection reader buffers from the socket (request headers and small payloads
/// arrive in one read; larger payloads are read straight into their own buffer).
pub const READ_BUFFER_BYTES: usize = 64 * 1024;

/// Reply data at least this long is written from its own buffer (vectored with its header)
/// instead of being copied into the writer's batch buffer.
pub const REPLY_COPY_LIMIT_BYTES: usize = 16 * 1024;

/// The writer stops batching replies into one write once its buffer holds this much.
pub const REPLY_BATCH_BYTES: usize = 256 * 1024;

/// Largest zero buffer kept for zeroing a range by plain writes, when a backend supports
/// neither trim nor write-zeroes.
pub const ZERO_BUFFER_BYTES: usize = 1024 * 1024;

/// Connection failures kept, newest last, in [`crate::nbd::ServeReport::recent_errors`].
pub const RECENT_ERRORS: usize = 32;

/// Pause after a failed `accept` (out of file descriptors, say) before trying again, so the
/// accept loop does not spin.
pub const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(100);

// The option bound must admit the longest legitimate GO/INFO: a 4-byte name length, a full
// name, and the info-request count.
const _: () = assert!(MAX_OPTION_BYTES as usize >= 4 + MAX_STRING_BYTES + 2 + 2 * 8);
// Payloads up to the spec's default maximum must never be treated as an attack.
const _: () = assert!(MAX_PAYLOAD_READ_BYTES >= DEFAULT_MAX_PAYLOAD_BYTES as u64);
const _: () = assert!(DEFAULT_MAX_PAYLOAD_BYTES <= MAX_ADVERTISED_PAYLOAD_BYTES);
// The default data budget admits at least one request of the default maximum payload.
const _: () = assert!(DEFAULT_MAX_IN_FLIGHT_BYTES_PER_CONNECTION >= DEFAULT_MAX_PAYLOAD_BYTES as usize);
// The batch buffer must be able to take a reply that was small enough to be copied.
const _: () = assert!(REPLY_BATCH_BYTES > REPLY_COPY_LIMIT_BYTES);
