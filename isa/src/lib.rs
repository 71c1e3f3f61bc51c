//! NetDAM ISA v1: the wire format, the instruction semantics and the types every other crate
//! shares. `docs/PROTOCOL.md` is the byte-level truth; this crate matches it.
//!
//! - [`wire`]: checked datagram views and encoders.
//! - [`checksum`]: CRC-32C, the datagram checksum.
//! - [`semantics`]: what memory and compute instructions do, over [`memory::SharedMemory`].
//! - [`compute`]: VADD's vectorised lane arithmetic and its per-chunk exclusion.
//! - [`control`]: HELLO and STAT payloads.
//! - [`crypto`]: ENCRYPT and DECRYPT operands, nonces and seals.
//! - [`limits`]: every bound, in one place.
//! - [`time`]: the protocol's own `Instant` and `Duration`.
//! - [`engine`]: the trait execution engines implement.
//! - [`extension`]: the extension opcodes' handler trait, registry and the shipped REDUCE.
//! - [`rng`]: the seeded generator of simulators, fault injectors and tests.

pub mod block;
pub mod checksum;
pub mod compute;
pub mod control;
pub mod crypto;
pub mod engine;
pub mod extension;
#[doc(hidden)]
pub mod fuzzing;
pub mod limits;
pub mod memory;
pub mod opcode;
pub mod rng;
pub mod semantics;
pub mod status;
pub mod time;
pub mod units;
pub mod wire;

pub use opcode::{LaneType, Opcode};
pub use status::Status;
pub use time::{Duration, Instant};
