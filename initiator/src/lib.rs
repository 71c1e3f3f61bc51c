//! The netdam client library: byte-addressable access to a target's regions.
//!
//! - [`Client`]: blocking, with `submit`/`wait` pipelining and chunked `read`/`write`.
//! - [`AsyncClient`]: tokio-based, clonable across tasks.
//! - [`session::Session`]: the sans-IO core both drive (sequencing, in-flight window,
//!   retransmission of idempotent requests).
//! - [`Op`]: one instruction to send.
//! - [`reduce`]: answers of the `reduce` extension (`Client::reduce`).
//! - [`allreduce`]: N workers sum buffers through a target region (VADD, FETCH_ADD barrier).
//! - [`hello`]: the two-step HELLO (cookie, then session) every driver runs.
//! - [`Volume`]: a block namespace as one disk over one or more sessions.
//! - [`nbd`]: the NBD export that serves a `Volume` to stock NBD clients.
//! - [`pieces`]: splitting a range into what one call or instruction carries.
//! - [`metrics`]: the initiator's `/metrics` (per-session shards, NBD gauges).
//! - [`top`]: what `netdam top` computes from two scrapes of `/metrics`.
//!
//! Dropping a client closes its session (CLOSE), so the target's slot is free at once.

pub mod allreduce;
pub mod async_client;
pub mod client;
pub mod error;
pub mod hello;
pub mod keys;
pub mod metrics;
pub mod nbd;
pub mod op;
pub mod pieces;
pub mod reduce;
pub mod session;
mod stamped;
pub mod swift;
pub mod target_info;
pub mod top;
pub mod volume;
pub mod volume_by_name;

pub use async_client::AsyncClient;
pub use client::{Client, ClientOptions, ClientPoll, Ticket};
pub use error::ClientError;
pub use op::Op;
pub use session::{Reply, SessionConfig};
pub use target_info::TargetInfo;
pub use volume::{Volume, VolumeOptions};
