//! Authentication of netdam sessions (docs/PROTOCOL.md, "Authentication"):
//!
//! - [`keyfile`]: tenant keys and the key files that hand them to initiators;
//! - [`hello`]: the HELLO proof that shows a tenant holds its key without sending it, and the
//!   per-session keys both sides derive from it (HKDF-SHA256);
//! - [`trailer`]: the trailer every datagram of an authenticated session carries: a MAC
//!   (AES-256-GCM's tag) over header and payload, and optionally the payload encrypted.
//!
//! Both the target and the initiator use this crate, so the two sides cannot drift apart.

pub mod hello;
pub mod keyfile;
pub mod trailer;

pub use hello::{method, HelloAuth, SessionKeys};
pub use keyfile::{Credentials, KeyError, KeyFile, KeyFileError, TenantKey, KEY_BYTES};
pub use trailer::{TrailerError, TRAILER_BYTES};
