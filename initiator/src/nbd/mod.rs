//! The NBD export: serves a netdam namespace (or any [`backend::NbdBackend`]) to the stock NBD
//! clients (the kernel's nbd-client, qemu, libnbd's tools, fio's nbd engine).
//!
//! - [`codec`]: the wire format, pure encode/decode.
//! - [`negotiate`]: option haggling as a sans-IO state machine.
//! - [`transmission`]: the per-request rules (validation, errors), sans-IO.
//! - [`server`]: the tokio driver, [`serve`]; [`listen`]: where it listens.
//! - [`limits`]: every bound in one place.
//!
//! Protocol: fixed newstyle handshake only; structured replies and extended headers when the
//! client asks; the `base:allocation` metadata context and `NBD_CMD_BLOCK_STATUS` when the
//! backend can tell holes from data (a netdam file namespace), no metadata context otherwise;
//! no TLS, no `NBD_CMD_CACHE`.
//!
//! Decisions, each where the spec leaves a choice:
//! - **Block sizes are always advertised** (minimum = the backend's block size), to every
//!   client, asked or not. A client that did not ask and sends unaligned requests gets clean
//!   `EINVAL` errors, as the spec allows; `NBD_REP_ERR_BLOCK_SIZE_REQD` is never sent, so old
//!   clients are not locked out. There is no read-modify-write: it would race with concurrent
//!   aligned writes to the same block.
//! - **The advertised maximum payload is a setting** (default 32 MiB, what clients assume
//!   anyway), independent of the backend's `max_request_bytes`: requests are split into
//!   backend calls no larger than that, run one after another within a request (requests run
//!   concurrently with each other).
//! - **Zeroing**: `NBD_CMD_WRITE_ZEROES` without `NO_HOLE` is done by the backend's trim,
//!   which the backend promises reads back as zeroes (unless its `trim_reads_zeroes` says
//!   otherwise); with `NO_HOLE`, by its write-zeroes. `FAST_ZERO` is advertised: fast
//!   requests that may trim succeed (trim is fast); other fast requests fail at once with
//!   `ENOTSUP`, since nothing promises the backend's write-zeroes is faster than a write. A
//!   backend that supports neither falls back to writing zeroes (never for fast requests).
//! - **Replies**: every reply is one message (a simple reply, or one chunk flagged DONE);
//!   reads are answered with one `OFFSET_DATA` chunk, so `NBD_CMD_FLAG_DF` always holds and
//!   `NBD_FLAG_SEND_DF` is offered once chunks are negotiated.
//! - **Block status**: one `BLOCK_STATUS` (or `BLOCK_STATUS_EXT`) chunk per request, whole
//!   blocks, never past the requested length (the backend may answer short; clients ask again).
//!   The requested length is a hint: an unaligned one is rounded to whole blocks. A backend
//!   that unexpectedly cannot tell answers "allocated" over the whole range, which is safe.
//! - **Leniency**: extended-header writes are accepted without `NBD_CMD_FLAG_PAYLOAD_LEN`,
//!   because qemu's client (8.2 to 10.0 at least) sends them so; `FUA` is accepted on every
//!   command; the reserved offset/length of `NBD_CMD_FLUSH` are ignored.

pub mod backend;
pub mod codec;
mod io;
pub mod limits;
pub mod listen;
pub mod negotiate;
pub mod server;
pub mod transmission;

pub use backend::{BackendError, NbdBackend};
pub use listen::{Listen, NbdListener, ParseListenError};
pub use server::{serve, serve_counting, ExportOptions, ServeReport};
